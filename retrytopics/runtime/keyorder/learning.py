"""What key order does before each poll (runtime/consumer/cycle.py asks it first): read the key state of the
partitions not started yet (a failed read at assignment is tried again), learn the tiers' passages the live
feed read (`KeyOrder.learn`), and have the tombstones of the chains they close written."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from retrytopics.core.keyorder.state_records import KeyStateRecord
from retrytopics.runtime.keyorder.ordering import KeyOrder, TierOrder

__all__ = ["KeyStateLearning", "KeyStateWrites"]


class KeyStateWrites(Protocol):
    """Where key-state records go (the hand-off's `KeyWrites`: acknowledged before an offset is finished)."""

    def write(self, records: Iterable[KeyStateRecord], then: Callable[[], None] | None = None) -> None: ...


class KeyStateLearning:
    """One loop's step before each poll (see the module docstring). `reading_key_state`: the hand-off's, asked
    before a read (it waits for transactions open in the key state)."""

    def __init__(
        self, order: KeyOrder | TierOrder, writes: KeyStateWrites, *, reading_key_state: Callable[[], None]
    ) -> None:
        self._order = order
        self._writes = writes
        self._reading_key_state = reading_key_state

    def __call__(self) -> None:
        order, writes = self._order, self._writes
        if order.not_started:
            self._reading_key_state()
        writes.write(order.read_pending())
        writes.write(order.learn())
