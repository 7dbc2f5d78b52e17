"""The failover tests' cluster and drill: one 3-node Apache Kafka cluster per test file (`connectors.cluster`),
every node brought back after each test, and the failover drill of bench/drill.py, loaded by path (bench/
is a folder of the checkout, not an installed package)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from retrytopics.connectors.cluster import KafkaCluster

_DRILL = Path(__file__).resolve().parents[3] / "bench" / "drill.py"


def load_drill() -> ModuleType:
    name = "retrytopics_failover_drill"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _DRILL)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    with KafkaCluster() as started:
        yield started


@pytest.fixture(autouse=True)
def _every_node_up(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test starts on a settled cluster (every node live, every partition led and fully in sync, as each node
    sees it: the previous test's fault may still be healing) and leaves no node down or frozen for the next."""
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").await_settled()
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").heal()


@pytest.fixture
def drill() -> ModuleType:
    return load_drill()
