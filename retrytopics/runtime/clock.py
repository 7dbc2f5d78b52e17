"""The runtime's one clock seam: every part of a consumer reads time through the `Clock` it was given, so a
test drives the whole runtime on a fake clock. A `ConsumerLoop` takes one (`clock=`; the in-memory broker's
`MemoryClock` is one, which a consume with nothing to deliver moves forward); an app takes its clock from its
client factory (`ClientFactory.clock`): the system clock for Kafka, and for a whole app on the in-memory broker
unless given another (its consumes wait in real time). The one exception is the Runner's bounded stop
(runtime/consumer/lifecycle.py): it waits for threads, which only real time moves.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


class Clock(Protocol):
    """`monotonic()` in seconds, for intervals and deadlines; `now_ms()` wall-clock milliseconds, for the times
    written into and compared with record headers (due times, failure times)."""

    def monotonic(self) -> float: ...
    def now_ms(self) -> int: ...


class SystemClock:
    """The process's clocks."""

    monotonic = staticmethod(time.monotonic)

    def now_ms(self) -> int:
        return int(time.time() * 1000)


SYSTEM_CLOCK: Clock = SystemClock()
