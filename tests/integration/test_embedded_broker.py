"""Guarantee: the embedded broker starts, answers metadata, and leaves no process or port behind;
start-up failures come with a clear error."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from retrytopics.connectors.embedded import EmbeddedBroker, free_port
from retrytopics.connectors.kafka import make_admin
from retrytopics.core.errors import BrokerExitedEarly, BrokerPortInUse

from .processes import alive as _alive
from .processes import gone
from .processes import listening as _listening


def test_lifecycle_leaves_nothing_behind() -> None:
    with EmbeddedBroker() as broker:
        assert broker.pid is not None
        pid, port = broker.pid, broker.port
        assert port is not None
        metadata = make_admin(broker.kafka_config()).list_topics(timeout=5)
        assert len(metadata.brokers) == 1
        assert _listening(port)
    assert not _alive(pid)
    assert not _listening(port)


def test_stops_on_exception() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with EmbeddedBroker() as broker:
            pid, port = broker.pid, broker.port
            raise RuntimeError("boom")
    assert pid is not None and port is not None
    assert not _alive(pid)
    assert not _listening(port)


def test_port_taken_is_a_clear_error() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(BrokerPortInUse, match=str(port)):
            EmbeddedBroker(port=port).start()


def test_early_exit_shows_the_log_tail(tmp_path) -> None:
    # An advertised URL tansu cannot parse makes it exit at once; the error must carry its log.
    broker = EmbeddedBroker(advertised_port=99999999, log_dir=tmp_path, startup_timeout_s=5)
    with pytest.raises(BrokerExitedEarly) as info:
        broker.start()
    assert info.value.log_tail.strip()
    assert "broker log" in str(info.value)


def test_sigint_to_the_owner_stops_the_broker(tmp_path) -> None:
    """Ctrl-C in the process that owns the broker stops it: no orphan, port closed."""
    script = textwrap.dedent(
        """
        import sys, time
        from retrytopics.connectors.embedded import EmbeddedBroker
        with EmbeddedBroker() as broker:
            print(broker.pid, broker.port, flush=True)
            time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    pid, port = map(int, child.stdout.readline().split())
    child.send_signal(2)
    child.wait(timeout=15)
    assert gone(pid, port, timeout_s=5)


def test_sigkill_of_the_owner_takes_the_broker_down() -> None:
    script = (
        "import time\nfrom retrytopics.connectors.embedded import EmbeddedBroker\n"
        "b = EmbeddedBroker().start()\nprint(b.pid, b.port, flush=True)\ntime.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    pid, port = map(int, child.stdout.readline().split())
    child.kill()
    child.wait(timeout=5)
    assert gone(pid, port, timeout_s=5)


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
