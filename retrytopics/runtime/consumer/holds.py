"""Why a consumer loop holds a partition (keeps it paused, nothing read): a list of reasons the poll cycle asks
each iteration (runtime/consumer/cycle.py); a partition is held while any reason holds it, released when none
does. A new reason is one class with `why` and `holds` plus one entry in the loop's list
(runtime/consumer/loop.py): a publish failing (here), key order (runtime/keyorder/holds.py), the retry-flood
guard (runtime/flood/holds.py), next handler concurrency.
"""

from __future__ import annotations

from typing import Protocol

from retrytopics.core.offsets import TopicPartition
from retrytopics.runtime.handoff.handoff import HandOff

__all__ = ["HoldReason", "PublishFailing"]


class HoldReason(Protocol):
    """One reason to hold partitions: `holds(tp)` is asked for every assigned partition once per poll, so it
    must be cheap (a lookup); `why` names the reason (logs, tests)."""

    @property
    def why(self) -> str: ...

    def holds(self, tp: TopicPartition) -> bool: ...


class PublishFailing:
    """A partition whose hand-off publish is failing is held: no records pile up in memory while it fails."""

    why = "publish_failing"

    def __init__(self, handoff: HandOff) -> None:
        self._handoff = handoff

    def holds(self, tp: TopicPartition) -> bool:
        return self._handoff.publisher.is_failing(tp)
