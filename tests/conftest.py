"""Shared fixtures: one Kafka broker per test session, unique topic names per test.

Broker selection (first match wins; the run's header line says which one was used):
1. `KAFKA_BOOTSTRAP_SERVERS` is set → that external cluster (plus the other `KAFKA_*` variables, see
   `KafkaConfig.from_env`);
2. `RETRYTOPICS_TEST_BROKER=apache` (the default) → Apache Kafka started by the suite from the jars that
   `scripts/setup.sh` resolved (`retrytopics.connectors.apache`);
3. `RETRYTOPICS_TEST_BROKER=tansu` → the embedded tansu broker (`retrytopics.connectors.embedded`);
4. `RETRYTOPICS_TEST_BROKER=cluster` → three Apache Kafka nodes, replication factor 3, min.insync.replicas 2
   (`retrytopics.connectors.cluster`);
5. `RETRYTOPICS_TEST_BROKER=testcontainers` → testcontainers' Kafka image. Opting in without a reachable
   Docker daemon is an error, never a silent fallback.

Tests that start a broker of their own (fault tests behind a TCP proxy) use the same kind, Apache Kafka when
the session's broker is external. The tansu lifecycle and smoke tests start tansu whatever is selected.

Embedded-broker behaviours the tests live with on tansu (never special-cased in library code):
- a consumer-group join takes about session.timeout.ms / 2, so test consumers use 6000 ms (a 3 s join);
- after a batched produce the high watermark under-reports, so tansu's `kafka_config()` produces with
  `batch.num.messages=1`;
- `offsets_for_times` answers are wrong, and aborted transactional records reach read_committed readers.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from retrytopics.connectors.config import KafkaConfig

# Spark workers must import the same interpreter's packages (retrytopics, confluent-kafka).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

#: Consumer settings the tests use for group membership (see the module docstring).
TEST_SESSION_TIMEOUT_MS = 6000

BROKER_KINDS = ("apache", "tansu", "cluster", "testcontainers")

# Property tests check outcomes, never speed: on a loaded 2-core machine one example can outlast hypothesis's
# default 200 ms deadline, which would fail a correct test. No deadline, for every test.
hypothesis_settings.register_profile("retrytopics", deadline=None)
hypothesis_settings.load_profile("retrytopics")


def selected_broker_kind() -> str:
    """external | apache | tansu | cluster | testcontainers, from the environment (see the module docstring)."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return "external"
    kind = os.environ.get("RETRYTOPICS_TEST_BROKER", "apache").strip().lower() or "apache"
    if kind not in BROKER_KINDS:
        raise pytest.UsageError(f"RETRYTOPICS_TEST_BROKER={kind!r}: expected one of {', '.join(BROKER_KINDS)}")
    return kind


def describe_selected_broker() -> str:
    kind = selected_broker_kind()
    if kind == "apache":
        from retrytopics.connectors.jars import KAFKA_VERSION

        return f"broker: Apache Kafka {KAFKA_VERSION} (KRaft, started by the suite; RETRYTOPICS_TEST_BROKER=apache)"
    if kind == "external":
        return f"broker: external cluster at {os.environ['KAFKA_BOOTSTRAP_SERVERS']}"
    return f"broker: {kind} (RETRYTOPICS_TEST_BROKER={kind})"


def pytest_report_header(config: pytest.Config) -> str:
    return describe_selected_broker()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # Also under -q, which hides the header: every run says which broker it ran on.
    terminalreporter.write_line(describe_selected_broker())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    # A confluent-kafka error raised straight from a client (not through map_kafka_errors) can carry a bare
    # KafkaError as its context; formatting it would end the whole session as INTERNALERROR.
    if call.excinfo is not None:
        from retrytopics.connectors.kafka import _drop_foreign_links

        _drop_foreign_links(call.excinfo.value)


#: The test files that took longest in a run of the README's command (each over 15 s; Spark driver starts,
#: brokers of their own, walks through tiers), longest first. A worker's session teardown (its Spark session
#: and broker stopping) is counted in the last test it runs, which then only looks long. They run first (`pytest_collection_modifyitems`),
#: and every shorter file after them in collection order.
LONGEST_FILES = (
    "tests/integration/test_readme_tour.py",
    "tests/integration/spark/test_builtin_parity.py",
    "tests/integration/runtime/test_stuck_calls.py",
    "tests/integration/spark/test_replay_input.py",
    "tests/integration/failover/test_cluster.py",
    "tests/integration/spark/test_replay.py",
    "tests/integration/spark/test_replay_identity.py",
    "tests/integration/test_apache_broker.py",
    "tests/integration/spark/test_broker_dlq.py",
    "tests/integration/spark/test_replay_trust.py",
    "tests/integration/security/test_security.py",
    "tests/integration/share/test_share_broker.py",
    "tests/integration/runtime/test_broker_crash.py",
    "tests/integration/spark/test_kafka_source.py",
    "tests/integration/spark/test_replay_signed.py",
    "tests/integration/security/test_security_replay.py",
    "tests/integration/spark/test_replay_key_order.py",
    "tests/integration/runtime/test_key_order_eos.py",
    "tests/integration/runtime/test_key_order.py",
    "tests/integration/spark/test_end_to_end.py",
    "tests/integration/spark/test_cli_text.py",
    "tests/integration/console/test_console_browser.py",
    "tests/integration/console/test_console_hostile_records.py",
    "tests/integration/share/test_share_consumer.py",
    "tests/integration/spark/test_audit.py",
    "tests/integration/test_cli_runtime.py",
    "tests/integration/runtime/test_memory_broker_contract.py",
    "tests/integration/spark/test_audit_key_order.py",
    "tests/unit/test_typing.py",
    "tests/integration/console/test_console_spark.py",
    "tests/integration/runtime/test_ambiguous_produce.py",
    "tests/integration/runtime/test_too_large.py",
    "tests/integration/runtime/test_wait_in_memory.py",
    "tests/integration/runtime/test_observability.py",
)


def pytest_configure(config: pytest.Config) -> None:
    missing = [path for path in LONGEST_FILES if not (config.rootpath / path).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FILES names files that do not exist: {missing}")
    # Under `--dist loadfile` a file runs whole on one worker, and the run ends when the last file does. xdist
    # queues files by their number of tests unless told otherwise, which put the longest files (one test each:
    # the README tour, the Spark CLI text test) last, where two could stack on one worker while the other
    # idled. Keep the collection's order instead (as `--no-loadscope-reorder` does): longest first, so that
    # the many short files fill the end of every worker.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: place for place, path in enumerate(LONGEST_FILES)}
    # A stable sort: tests keep their order within a file, and the other files theirs.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@dataclass(frozen=True)
class TestBroker:
    """The broker the session runs against."""

    kind: str  # "external" | "apache" | "tansu" | "cluster" | "testcontainers"
    kafka: KafkaConfig

    @property
    def is_tansu(self) -> bool:
        return self.kind == "tansu"


def _testcontainers_broker() -> Iterator[TestBroker]:
    import docker
    from testcontainers.kafka import KafkaContainer

    try:
        docker.from_env().ping()
    except Exception as exc:
        raise RuntimeError(f"RETRYTOPICS_TEST_BROKER=testcontainers, but no Docker daemon answers: {exc}") from exc
    with KafkaContainer().with_kraft() as container:
        yield TestBroker("testcontainers", KafkaConfig(bootstrap=container.get_bootstrap_server()))


@pytest.fixture(autouse=True)
def _package_logging_as_found() -> Iterator[None]:
    """Every test ends with the `retrytopics` logger as it found it. The CLI, run in process by some tests,
    routes the package's loggers to stderr and stops their propagation (`logs.configure_logging`): a later
    test in the same process then saw none of them in `caplog` (found when two workers ran the files in
    another order)."""
    logger = logging.getLogger("retrytopics")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


@pytest.fixture(scope="session")
def broker() -> Iterator[TestBroker]:
    kind = selected_broker_kind()
    if kind == "external":
        yield TestBroker("external", KafkaConfig.from_env())
        return
    if kind == "testcontainers":
        yield from _testcontainers_broker()
        return
    from retrytopics.connectors.brokers import local_broker

    with local_broker(kind) as started:
        yield TestBroker(kind, started.kafka_config())


@pytest.fixture(scope="session")
def local_broker_kind() -> str:
    """The kind of broker a test starts for itself (behind a fault proxy): the session's, or apache."""
    kind = selected_broker_kind()
    return kind if kind in ("apache", "tansu") else "apache"


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
