"""The retry-flood guard's hold reason (runtime/consumer/holds.py): a guarded handler's partitions, its source
on the main consumer and its tiers on its tier consumers, are held while its guard refuses calls (open, a probe
out, ramping): the consumers stay in their groups and commit what is done, and read nothing of it."""

from __future__ import annotations

from collections.abc import Mapping

from retrytopics.core.offsets import TopicPartition
from retrytopics.runtime.flood.breaker import HandlerGuard

__all__ = ["FloodHold"]


class FloodHold:
    """Holds a partition while the guard of its topic's handler refuses calls."""

    why = "flood_guard"

    def __init__(self, guards: Mapping[str, HandlerGuard]) -> None:
        self._guards = dict(guards)  # topic (a source or a tier) -> its handler's guard

    def holds(self, tp: TopicPartition) -> bool:
        guard = self._guards.get(tp[0])
        return guard is not None and guard.refusing()
