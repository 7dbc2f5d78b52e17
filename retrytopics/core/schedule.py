"""Paused partitions and when to resume them: a due-time heap, plus holds that only an event releases.

Pure: standard library only; time is an argument. A tier consumer pauses a partition whose head record is not
due yet and asks this schedule how long it may sleep in `consume()`::

    schedule = PauseSchedule()
    schedule.pause_until(("orders.retry.30s", 0), due_ms=31_000)
    schedule.wait_ms(now_ms=30_000, cap_ms=1_000)      # 1000: never sleep past the cap (heartbeats, stop)
    schedule.wait_ms(now_ms=30_990, cap_ms=1_000)      # 10
    schedule.pop_due(now_ms=31_000)                    # [("orders.retry.30s", 0)]: resume it now

A *hold* pauses a partition until `release()` (a failed republish is being retried). A partition is paused
while it has a pending due time or a hold, and `pop_due` never returns a held partition.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["PauseSchedule"]

P = TypeVar("P", bound=Hashable)


class PauseSchedule(Generic[P]):
    """Paused partitions with due times (a heap with lazy deletion) and holds."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, P]] = []
        self._due: dict[P, tuple[int, int]] = {}  # partition -> (due_ms, sequence) of its live heap entry
        self._held: set[P] = set()
        self._sequence = itertools.count()

    def pause_until(self, tp: P, *, due_ms: int) -> None:
        """Pause `tp` until `due_ms` (replacing an earlier due time)."""
        entry = (due_ms, next(self._sequence))
        self._due[tp] = entry
        heapq.heappush(self._heap, (*entry, tp))

    def hold(self, tp: P) -> None:
        """Pause `tp` until `release(tp)`."""
        self._held.add(tp)

    def release(self, tp: P) -> bool:
        """Lift the hold on `tp`; True when nothing else keeps it paused (the caller resumes it)."""
        if tp not in self._held:
            return False
        self._held.discard(tp)
        return tp not in self._due

    def drop(self, tp: P) -> None:
        """Forget `tp` entirely (it was revoked): its timer will never fire."""
        self._due.pop(tp, None)
        self._held.discard(tp)

    def is_paused(self, tp: P) -> bool:
        return tp in self._due or tp in self._held

    def is_held(self, tp: P) -> bool:
        return tp in self._held

    @property
    def paused(self) -> frozenset[P]:
        """Every paused partition."""
        return frozenset(self._due) | frozenset(self._held)

    def pop_due(self, now_ms: int) -> list[P]:
        """Partitions whose due time has come and that no hold keeps paused, earliest first."""
        ready: list[P] = []
        while self._heap and self._heap[0][0] <= now_ms:
            due_ms, sequence, tp = heapq.heappop(self._heap)
            if self._due.get(tp) != (due_ms, sequence):
                continue  # replaced or dropped
            del self._due[tp]
            if tp not in self._held:
                ready.append(tp)
        return ready

    def next_due_ms(self) -> int | None:
        """The earliest pending due time, or None."""
        while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][:2]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def wait_ms(self, now_ms: int, cap_ms: int) -> int:
        """How long a poll may block: until the next due time, at most `cap_ms`, never negative."""
        due = self.next_due_ms()
        return cap_ms if due is None else max(0, min(cap_ms, due - now_ms))
