"""Key order's reads of its key state: at assignment (an assignment listener, runtime/consumer/rebalance.py: the
key state of the assigned partitions read to its end before any of their records; a partition whose read failed
is held, unstarted), and before each poll (runtime/consumer/cycle.py asks it first: the reads not done yet are
tried again, the tiers' passages the live feed read are learnt, `KeyOrder.learn`). The tombstones of the chains
they close are written."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from retrytopics.core.keyorder.state_records import KeyStateRecord
from retrytopics.core.offsets import TopicPartition
from retrytopics.runtime.keyorder.ordering import KeyOrder, TierOrder

__all__ = ["KeyStateLearning", "KeyStateWrites"]


class KeyStateWrites(Protocol):
    """Where key-state records go (the hand-off's `KeyWrites`: acknowledged before an offset is finished)."""

    def write(self, records: Iterable[KeyStateRecord], then: Callable[[], None] | None = None) -> None: ...


class KeyStateLearning:
    """One loop's key-state reads (see the module docstring). `reading_key_state`: the hand-off's, asked before a
    read (it waits for transactions open in the key state)."""

    def __init__(
        self, order: KeyOrder | TierOrder, writes: KeyStateWrites, *, reading_key_state: Callable[[], None]
    ) -> None:
        self._order = order
        self._writes = writes
        self._reading_key_state = reading_key_state

    def assigned(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        """Rebuild the key state of the ordered partitions among `tps`; returns those not started (held)."""
        order = self._order
        self._reading_key_state()
        self._writes.write(order.assigned(tps))
        return [tp for tp in tps if order.holds(tp)]

    def revoked(self, tps: list[TopicPartition]) -> None:
        self._order.revoked(tps)

    def __call__(self) -> None:
        order, writes = self._order, self._writes
        if order.not_started:
            self._reading_key_state()
        writes.write(order.read_pending())
        writes.write(order.learn())
