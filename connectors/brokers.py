"""Local brokers by name, for the test fixtures, the demo and the benchmarks.

- `apache`: Apache Kafka itself (`connectors.apache`), jars resolved by Maven; starts in about 5 s. The
  broker that counts: the test suite and CI run on it.
- `tansu`: the embedded tansu broker from the `embedded` extra (`connectors.embedded`), in memory; starts
  in well under a second, but differs from Kafka in measured ways (docs/testing.md).
- `cluster`: three Apache Kafka nodes in one KRaft quorum (`connectors.cluster`), replication factor 3 and
  `min.insync.replicas=2`; starts in about 10 s; for failover runs.

    with local_broker("apache") as broker:
        run(broker.kafka_config())
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from retrytopics.connectors.config import KafkaConfig

__all__ = ["BROKER_NAMES", "LocalBroker", "local_broker"]

BROKER_NAMES = ("apache", "tansu", "cluster")


class LocalBroker(Protocol):
    """What the demo, the fixtures and the benchmarks use of a broker they start themselves."""

    kind: str

    @property
    def port(self) -> int | None: ...
    @property
    def log_path(self) -> Path: ...
    @property
    def bootstrap(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def pid(self) -> int | None: ...
    def kafka_config(self, **fields: object) -> KafkaConfig: ...
    def start(self) -> Self: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def log_tail(self, lines: int = ...) -> str: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


def local_broker(name: str, *, advertised_port: int | None = None, port: int | None = None) -> LocalBroker:
    """A not yet started broker of kind `name` ("apache", "tansu" or "cluster"; a cluster picks its own ports
    and cannot sit behind a proxy)."""
    if name == "apache":
        from retrytopics.connectors.apache import ApacheKafkaBroker

        return ApacheKafkaBroker(port=port, advertised_port=advertised_port)
    if name == "tansu":
        from retrytopics.connectors.embedded import EmbeddedBroker

        return EmbeddedBroker(port=port, advertised_port=advertised_port)
    if name == "cluster":
        if port is not None or advertised_port is not None:
            raise ValueError("the cluster picks free ports for its nodes; port and advertised_port must be unset")
        from retrytopics.connectors.cluster import KafkaCluster

        return KafkaCluster()
    raise ValueError(f"unknown broker {name!r}; expected one of {', '.join(BROKER_NAMES)}")
