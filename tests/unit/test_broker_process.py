"""Guarantee: stopping a local broker never fails because the kernel reaps its SIGKILLed JVM late. A broker that
does not finish its controlled shutdown within its bound is SIGKILLed, and a SIGKILLed process always ends, so
the stop waits for that end instead of raising (a JVM stuck in disk I/O on a loaded machine is reaped only when
the I/O returns; the 3-node cluster's rolling restart then left the node's port taken for the next step)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from retrytopics.connectors.broker_process import BrokerProcess


class _SlowToReap:
    """A broker JVM that ignores SIGTERM and, once SIGKILLed, is reaped later than any bound."""

    pid = 4242

    def __init__(self) -> None:
        self.killed = False
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        pass

    def kill(self) -> None:
        self.killed = True

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None:
            raise subprocess.TimeoutExpired("java", timeout)
        assert self.killed, "waited without a bound for a process that was never killed"
        self.returncode = -9
        return self.returncode


def test_a_broker_killed_after_its_shutdown_bound_is_reaped_however_late(tmp_path: Path) -> None:
    broker = BrokerProcess(
        host="127.0.0.1", port=None, advertised_port=None, startup_timeout_s=1, log_path=tmp_path / "log"
    )
    process = _SlowToReap()
    broker._process = process  # type: ignore[assignment]

    broker._terminate(0.1)

    assert process.killed and process.returncode == -9 and broker.pid is None
