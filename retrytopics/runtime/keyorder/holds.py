"""Key order's reason to hold a partition (runtime/consumer/holds.py): its key state is not read yet, or the
record it stopped at (`Held`: `max_blocked_keys`, the parked-records bound, a tier's key state not read) may
still not proceed."""

from __future__ import annotations

from retrytopics.core.offsets import TopicPartition
from retrytopics.runtime.keyorder.ordering import KeyOrder, TierOrder

__all__ = ["KeyOrderHold"]


class KeyOrderHold:
    """Holds what the loop's key order (`KeyOrder.holds`, `TierOrder.holds`) says it stops."""

    why = "key_order"

    def __init__(self, order: KeyOrder | TierOrder) -> None:
        self._order = order

    def holds(self, tp: TopicPartition) -> bool:
        return self._order.holds(tp)
