"""What the local brokers (`connectors.apache`, `connectors.embedded`) share: a child process in its own
session that dies with its owner, its log file, a wait until it answers metadata, and stop/kill.

A subclass builds its command line in `start()`, calls `_spawn()` and `_await_metadata()`, and decides in
`stop()` what to clean up after `_terminate()`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from retrytopics.core.errors import BrokerExitedEarly, BrokerPortInUse, EmbeddedBrokerError

__all__ = ["BrokerProcess", "environment_without", "free_port", "port_is_free"]

_PR_SET_PDEATHSIG = 1

Self = TypeVar("Self", bound="BrokerProcess")


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as a server socket binds: a port left in TIME_WAIT by a killed broker is still usable
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # If the Python process is SIGKILLed, the kernel sends the broker SIGTERM: no orphan brokers.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class BrokerProcess:
    """A broker child process. `advertised_port` lets a test put a TCP proxy in front of the broker: clients
    then reconnect through the proxy, because Kafka clients always follow the advertised address."""

    kind = "broker"
    #: how error messages name the broker
    product = "the broker"

    def __init__(
        self, *, host: str, port: int | None, advertised_port: int | None, startup_timeout_s: float, log_path: Path
    ) -> None:
        self.host = host
        self.port = port
        self.advertised_port = advertised_port
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise EmbeddedBrokerError("the broker has not been started")
        return f"{self.host}:{self.advertised_port or self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self: Self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def _claim_port(self, port: int | None) -> int:
        """`port`, or a free one; a taken port is a clear error."""
        chosen = free_port(self.host) if port is None else port
        if not port_is_free(self.host, chosen):
            raise BrokerPortInUse(f"{self.host}:{chosen} is already in use; pick another port or leave it unset")
        return chosen

    def _spawn(self, command: list[str], env: Mapping[str, str] | None = None) -> None:
        if self._process is not None:
            raise EmbeddedBrokerError("the broker is already running")
        log_file = open(self.log_path, "ab")
        try:
            self._process = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
                preexec_fn=_die_with_parent,
                start_new_session=True,
            )
        finally:
            log_file.close()

    def _await_metadata(self, client_config: Mapping[str, Any], ports: str) -> None:
        """Wait until the broker lists itself in a metadata answer; kill it and raise with its log tail if it
        exits or the start-up timeout passes. `client_config` points straight at the listener (a proxy in front
        may not be running yet); `ports` names them in the port-in-use error."""
        from confluent_kafka.admin import AdminClient

        process = self._process
        assert process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        admin = AdminClient({**client_config, "log_level": 0})
        try:
            while True:
                if process.poll() is not None:
                    tail = self.log_tail()
                    if "Address already in use" in tail or "AddrInUse" in tail:
                        raise BrokerPortInUse(f"{ports} is already in use")
                    raise BrokerExitedEarly(
                        f"{self.product} exited with status {process.returncode} during start-up", tail
                    )
                try:
                    if admin.list_topics(timeout=0.5).brokers:
                        return
                except Exception:  # noqa: BLE001 - not ready yet; the deadline bounds the loop
                    pass
                if time.monotonic() > deadline:
                    raise BrokerExitedEarly(
                        f"{self.product} did not answer within {self.startup_timeout_s}s", self.log_tail()
                    )
                time.sleep(0.05)
        except BaseException:
            self.kill()
            raise

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"

    def _terminate(self, timeout_s: float) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after `timeout_s`; reaps the process; idempotent."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            # a SIGKILLed process always ends, but one stuck in disk I/O ends only when the I/O returns
            process.wait()

    def kill(self) -> None:
        """SIGKILL the broker (for fault tests)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def __enter__(self: Self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def environment_without(names: set[str]) -> dict[str, str]:
    """This process's environment without `names` (settings a broker binary would also read from it)."""
    return {k: v for k, v in os.environ.items() if k not in names}
