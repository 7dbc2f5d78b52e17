"""A stop always ends in a bound (runtime/consumer/lifecycle.py), on the in-memory broker:
`run_until_stopped` returns within its bound after SIGTERM, or at once on a second one, with a handler that
never returns, and nothing of that record is committed. The same on Apache Kafka:
tests/integration/runtime/test_signals.py. A second signal is a second signal however soon it comes: even
while the first one is still being handled (a double Ctrl-C, or a supervisor's quick repeat on a loaded machine).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

import pytest

from retrytopics.runtime.consumer import lifecycle
from retrytopics.testing import MemoryBroker

from ..kit import stuck_app


def _sigterm_once_handled(original: Any, count: int) -> None:
    """SIGTERM to this process `count` times, each once `run_until_stopped` handles it (`original`, the handler
    before, would end the test process)."""
    deadline = time.monotonic() + 10
    while signal.getsignal(signal.SIGTERM) is original and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in range(count):
        if signal.getsignal(signal.SIGTERM) is original:
            return  # never installed, or already restored: run_until_stopped returned
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)


@pytest.mark.parametrize("second_signal", [False, True], ids=["bound", "second-sigterm"])
def test_sigterm_with_a_handler_that_never_returns_stops_waiting_in_its_bound(
    second_signal: bool, caplog: pytest.LogCaptureFixture
) -> None:
    broker, entered, release = MemoryBroker(), threading.Event(), threading.Event()
    broker.create_topic("orders")
    broker.append("orders", b"ok")
    broker.append("orders", b"stuck")
    app = stuck_app(broker, entered, release)
    app.start(main=True)
    runner = app._runner
    try:
        assert entered.wait(10)
        threading.Thread(
            target=_sigterm_once_handled,
            args=(signal.getsignal(signal.SIGTERM), 2 if second_signal else 1),
            daemon=True,
        ).start()
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="retrytopics"):
            runner.run_until_stopped(stop_timeout_s=60.0 if second_signal else 0.5)
        waited = time.monotonic() - started
        assert waited < 5, waited
        assert app.running  # the stuck loop was left behind
        assert any("did not stop" in r.getMessage() for r in caplog.records)
        # nothing past the stuck record is committed (the first record may be, or not yet)
        assert broker.committed("billing").get(("orders", 0), 0) <= 1
    finally:
        release.set()
        assert app.wait(10)


# -- signals: the first asks the loops to stop, a second ends the wait for them, however soon it comes --


def _wait(event: threading.Event, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not event.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)  # the main thread must run bytecode for Python to run the signal handlers
    return event.is_set()


def test_a_second_signal_during_the_handling_of_the_first_is_a_second_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    # setup: the second SIGTERM arrives while the first one's handler is writing its log line
    stop, hurry = threading.Event(), threading.Event()
    sent: list[int] = []
    real_info = lifecycle.log.info

    def info(*args: object, **kwargs: object) -> None:
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)
        real_info(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lifecycle.log, "info", info)

    # when
    with lifecycle._stop_on_signals(stop, hurry):
        os.kill(os.getpid(), signal.SIGTERM)
        hurried = _wait(hurry, 5)

    # then: the loops were asked to stop, and the wait for them is over
    assert stop.is_set() and hurried


def test_one_signal_asks_the_loops_to_stop_and_waits_for_them() -> None:
    stop, hurry = threading.Event(), threading.Event()
    with lifecycle._stop_on_signals(stop, hurry):
        os.kill(os.getpid(), signal.SIGTERM)
        assert _wait(stop, 5)
        time.sleep(0.05)
    assert not hurry.is_set()
