"""Threads, signals and shutdown for a set of consumer loops.

Each loop runs in its own thread; they share one stop event. `SIGTERM`/`SIGINT` (when running in the main
thread) only set that event: each loop finishes the handler call in progress, drains its producer, commits
what is finished and leaves its group. A handler that raises a `BaseException` (e.g. `KeyboardInterrupt`)
stops every loop the same way, without committing its record, and `run_until_stopped` re-raises it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from retrytopics.runtime.loop import ConsumerLoop

__all__ = ["Runner"]

log = logging.getLogger("retrytopics.runtime")


class Runner:
    """Starts loops in threads and stops them together."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop_event = stop
        self.loops: list[ConsumerLoop] = []
        self._threads: list[threading.Thread] = []

    def start(self, loops: list[ConsumerLoop]) -> None:
        for loop in loops:
            thread = threading.Thread(target=loop.run, name=f"retrytopics:{loop.settings.name}", daemon=True)
            self.loops.append(loop)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout_s: float | None = 30.0) -> bool:
        """Ask every loop to stop and wait for them; True if all stopped within `timeout_s`."""
        self.stop_event.set()
        return self.join(timeout_s)

    def join(self, timeout_s: float | None = None) -> bool:
        for thread in self._threads:
            thread.join(timeout_s)
        return not any(t.is_alive() for t in self._threads)

    @property
    def crash(self) -> BaseException | None:
        return next((loop.crash for loop in self.loops if loop.crash is not None), None)

    def run_until_stopped(self) -> None:
        """Block until stopped (signal, `stop()`, or a crash); then join, and re-raise a crash."""
        with _stop_on_signals(self.stop_event):
            while not self.stop_event.wait(0.5):
                pass
        self.join()
        crash = self.crash
        if crash is not None:
            raise crash


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s; stopping after the current record", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
