"""Threads, signals and shutdown for a set of consumer loops.

Each loop runs in its own thread; they share one stop event. `SIGTERM`/`SIGINT` (when running in the main
thread) only set that event: each loop finishes the handler call in progress, drains its producer, commits
what is finished and leaves its group. A handler that raises a `BaseException` (e.g. `KeyboardInterrupt`)
stops every loop the same way, without committing its record, and `run_until_stopped` re-raises it.

The wait for that is bounded: `run_until_stopped` returns `STOP_TIMEOUT_S` after the first signal, or at once
on a second one, whether or not every loop finished (a handler call that never returns, a client call stuck
on a frozen broker). A loop left behind has committed nothing past what it finished, so its records are read
again by the next owner of their partitions: nothing is lost. Loop threads are daemons, so the process exits.

A watchdog thread asks each loop, twice a second, whether a handler call has outlived
`max.poll.interval.ms` (`ConsumerLoop.watch`).
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Protocol

from retrytopics.runtime.consumer.settings import LoopSettings

__all__ = ["STOP_TIMEOUT_S", "Loop", "Runner"]

log = logging.getLogger("retrytopics.runtime")

#: the longest `run_until_stopped` waits for the loops after the first SIGTERM/SIGINT (a Kubernetes pod's
#: default grace period is 30 s)
STOP_TIMEOUT_S = 25.0

#: how often the watchdog looks for handler calls past `max.poll.interval.ms`
_WATCH_EVERY_S = 0.5


class Loop(Protocol):
    """What the runner and the app ask of a consumer loop: `ConsumerLoop` (runtime/consumer/loop.py) or
    `ShareConsumerLoop` (runtime/consumer/share_loop.py)."""

    settings: LoopSettings
    crash: BaseException | None
    running: bool

    @property
    def healthy(self) -> bool: ...
    @property
    def paused_partitions(self) -> int: ...
    def run(self) -> None: ...
    def watch(self) -> None: ...


class Runner:
    """Starts loops in threads and stops them together."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop_event = stop
        self.loops: list[Loop] = []
        self._threads: list[threading.Thread] = []

    def start(self, loops: list[Loop]) -> None:
        for loop in loops:
            thread = threading.Thread(target=loop.run, name=f"retrytopics:{loop.settings.name}", daemon=True)
            self.loops.append(loop)
            self._threads.append(thread)
            thread.start()
        if loops:
            threading.Thread(target=self._watch, args=(list(loops),), name="retrytopics:watchdog", daemon=True).start()

    def _watch(self, loops: list[Loop]) -> None:
        while not self.stop_event.wait(_WATCH_EVERY_S):
            for loop in loops:
                loop.watch()

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

    def run_until_stopped(self, stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Block until stopped (signal, `stop()`, or a crash); then wait for the loops, at most
        `stop_timeout_s` or until a second signal (module docstring), and re-raise a crash."""
        hurry = threading.Event()
        with _stop_on_signals(self.stop_event, hurry):
            while not self.stop_event.wait(0.5):
                pass
            deadline = time.monotonic() + stop_timeout_s
            while any(t.is_alive() for t in self._threads) and not hurry.is_set() and time.monotonic() < deadline:
                hurry.wait(0.05)
        stuck = [loop.settings.name for loop, t in zip(self.loops, self._threads, strict=True) if t.is_alive()]
        if stuck:
            log.error(
                "%s did not stop %s; exiting without them (nothing they did not finish is committed: its "
                "records are read again)",
                ", ".join(stuck),
                "before the second signal" if hurry.is_set() else f"within {stop_timeout_s:g} s",
            )
        crash = self.crash
        if crash is not None:
            raise crash


@contextmanager
def _stop_on_signals(stop: threading.Event, hurry: threading.Event) -> Iterator[None]:
    """SIGTERM/SIGINT set `stop`; a second one sets `hurry` (stop waiting for the loops)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    received = itertools.count()

    def handle(signum: int, _frame: FrameType | None) -> None:
        # Counted and acted on before anything else: Python may run this handler again, for a second signal,
        # in the middle of the first call (while it logs), and that one must find the first counted.
        first = next(received) == 0 and not stop.is_set()
        name = signal.Signals(signum).name
        if not first:
            hurry.set()
            log.warning("received %s again; exiting without waiting for the consumers to stop", name)
            return
        stop.set()
        log.info(
            "received %s; stopping after the current record (at most %g s; a second %s exits at once)",
            name,
            STOP_TIMEOUT_S,
            name,
        )

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
