"""One handler's in-flight window in one consumer: which admitted record may start now, and which waits for
its gate (docs/concurrency.md). Pure bookkeeping: no threads, no clock, no I/O; the calls are
runtime/concurrency/calls.py's.

A record's *gate* is what it must not share the flight with: its key in its partition (`OrderMode.KEY`), its
partition (`OrderMode.PARTITION`), nothing (`OrderMode.NONE`, or a keyless record in key mode). While a
record of a gate is in flight, the later records of that gate wait here in offset order, and `settle`
hands the next one out when the call before it returned: so two records of one gate are never in flight
together, and they start in the order they were admitted.

At most `calls` are in flight. The records admitted beyond them (their gate free) wait for a call in admission
order, up to `calls` more: a call that returns is followed at once by a record read already, rather than by a
fetch. `room` is how many more may be admitted (the consumer asks Kafka for no more); `full` (no room, or
`max_bytes` admitted) says a record read now is not admitted but read again later.

A record may be started and *deferred* at once (an admission check at start time, key order's, said not yet):
it gives its call back and keeps its gate, so its key's later records stay behind it, until `undefer` makes it
ready for a call again (at the next poll).

A partition revoked or lost is `forget`-ten: its waiting records are dropped (they never started, and their
offsets were never finished, so nothing is committed past them); its calls still in flight count until they
return, and what they return is for an older generation of the partition and starts nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from retrytopics.core.concurrency import OrderMode
from retrytopics.core.offsets import TopicPartition

__all__ = ["Slot", "Window", "gate_of"]

T = TypeVar("T")

#: the gate of every record of a partition in `OrderMode.PARTITION`
_WHOLE_PARTITION = ("partition",)


def gate_of(order: OrderMode, key: bytes | None) -> Hashable | None:
    """What a record with `key` must not share the flight with, within its partition (None: nothing)."""
    if order is OrderMode.KEY:
        return key
    if order is OrderMode.PARTITION:
        return _WHOLE_PARTITION
    return None


@dataclass(slots=True, eq=False)
class Slot(Generic[T]):
    """One admitted record: its partition, its gate, its size in bytes and the caller's item (the call)."""

    tp: TopicPartition
    gate: Hashable | None
    size: int
    item: T
    generation: int = 0


@dataclass(slots=True)
class _Partition:
    generation: int = 0
    admitted: int = 0  # admitted and not settled: in flight, waiting behind a gate or for a free call
    waiting: int = 0  # of which not started


@dataclass(slots=True)
class Window(Generic[T]):
    """The window of one handler in one consumer (see the module docstring): at most `calls` in flight, and up
    to as many again admitted ahead of them (`full` from then on, or from `max_bytes`), so that a call that
    returns is followed at once by a record already read."""

    calls: int
    max_bytes: int
    #: admitted and not settled (in flight or waiting), over every partition
    records: int = 0
    bytes: int = 0
    #: calls started and not returned (the in-flight gauge)
    in_flight: int = 0
    _partitions: dict[TopicPartition, _Partition] = field(default_factory=dict)
    #: (tp, generation, gate) -> the records of a busy gate waiting for it, in admission order
    _gates: dict[tuple[TopicPartition, int, Hashable], deque[Slot[T]]] = field(default_factory=dict)
    #: records whose gate is theirs, waiting for a free call, in admission order
    _ready: deque[Slot[T]] = field(default_factory=deque)
    #: records started and deferred (`defer`): each keeps its gate, waiting for `undefer`
    _deferred: list[Slot[T]] = field(default_factory=list)

    @property
    def full(self) -> bool:
        """Admit no more of the handler's records until calls return."""
        return self.records >= 2 * self.calls or self.bytes >= self.max_bytes

    @property
    def room(self) -> int:
        """How many more records may be admitted (by count; `full` also minds the bytes)."""
        return max(0, 2 * self.calls - self.records)

    @property
    def over_bytes(self) -> bool:
        return self.bytes >= self.max_bytes

    def admit(self, slot: Slot[T]) -> bool:
        """Count `slot` in; True: it starts now; False: it waits for its gate or a free call (given back by
        `settle`)."""
        part = self._partitions.get(slot.tp)
        if part is None:
            part = self._partitions[slot.tp] = _Partition()
        slot.generation = part.generation
        part.admitted += 1
        self.records += 1
        self.bytes += slot.size
        if slot.gate is not None:
            at = (slot.tp, part.generation, slot.gate)
            queue = self._gates.get(at)
            if queue is not None:
                queue.append(slot)
                part.waiting += 1
                return False
            self._gates[at] = deque()
        if self.in_flight < self.calls:
            self.in_flight += 1
            return True
        self._ready.append(slot)
        part.waiting += 1
        return False

    def settle(self, slot: Slot[T]) -> tuple[bool, list[Slot[T]]]:
        """`slot`'s call returned: (whether its partition is still of this generation, so its outcome counts;
        the records to start now: the next of its gate, if a call is free for it, and those waiting for one)."""
        self.in_flight -= 1
        self.records -= 1
        self.bytes -= slot.size
        part = self._partitions.get(slot.tp)
        current = part is not None and part.generation == slot.generation
        if part is not None:
            part.admitted -= 1
            if part.admitted == 0 and not current:
                del self._partitions[slot.tp]
        if current and slot.gate is not None:
            at = (slot.tp, slot.generation, slot.gate)
            queue = self._gates.get(at)
            if queue:
                self._ready.append(queue.popleft())  # its gate passes to it: it waits for a call now
            else:
                self._gates.pop(at, None)
        return current, self._startable()

    def defer(self, slot: Slot[T]) -> list[Slot[T]]:
        """`slot` was started but may not be called yet: it gives its call back and keeps its gate (its key's
        later records stay behind it) until `undefer`; returns the records to start in its place."""
        self.in_flight -= 1
        self._partitions[slot.tp].waiting += 1
        self._deferred.append(slot)
        return self._startable()

    @property
    def deferred(self) -> int:
        return len(self._deferred)

    def undefer(self) -> list[Slot[T]]:
        """The deferred records wait for a call again, ahead of the others (they were started before them);
        returns those to start now."""
        if not self._deferred:
            return []
        self._ready.extendleft(reversed(self._deferred))
        self._deferred.clear()
        return self._startable()

    def _startable(self) -> list[Slot[T]]:
        ready, started = self._ready, []
        while ready and self.in_flight < self.calls:
            slot = ready.popleft()
            part = self._partitions[slot.tp]
            part.waiting -= 1
            self.in_flight += 1
            started.append(slot)
        return started

    def in_flight_of(self, tps: Iterable[TopicPartition]) -> int:
        """The calls of `tps` not returned yet (of their current generation or an older one)."""
        parts = self._partitions
        return sum(p.admitted - p.waiting for tp in tps if (p := parts.get(tp)) is not None)

    def drop_waiting(self, tps: Iterable[TopicPartition]) -> list[Slot[T]]:
        """The records of `tps` not started never start (returned); their calls in flight go on and still
        count, and what they return counts too."""
        tps = set(tps)
        dropped: list[Slot[T]] = []
        for at, queue in self._gates.items():
            if at[0] in tps and queue:
                dropped.extend(queue)
                queue.clear()
        if any(slot.tp in tps for slot in self._ready):
            dropped.extend(slot for slot in self._ready if slot.tp in tps)
            self._ready = deque(slot for slot in self._ready if slot.tp not in tps)
        if any(slot.tp in tps for slot in self._deferred):
            dropped.extend(slot for slot in self._deferred if slot.tp in tps)
            self._deferred = [slot for slot in self._deferred if slot.tp not in tps]
        for slot in dropped:
            self.records -= 1
            self.bytes -= slot.size
            part = self._partitions[slot.tp]
            part.admitted -= 1
            part.waiting -= 1
        return dropped

    def forget(self, tps: Iterable[TopicPartition]) -> list[Slot[T]]:
        """`tps` were revoked or lost: their records not started are dropped (returned); their calls in flight
        still count until they return, and what they return is of an older generation."""
        tps = list(tps)
        dropped = self.drop_waiting(tps)
        for tp in tps:
            part = self._partitions.get(tp)
            if part is None:
                continue
            for at in [at for at in self._gates if at[0] == tp]:
                del self._gates[at]
            part.generation += 1
            if part.admitted == 0:
                del self._partitions[tp]
        return dropped

    def busy(self, tp: TopicPartition, gate: Hashable) -> bool:
        """Whether a record of `gate` in `tp` is admitted and not settled (in flight, or waiting)."""
        part = self._partitions.get(tp)
        return part is not None and (tp, part.generation, gate) in self._gates

    @property
    def partitions(self) -> list[TopicPartition]:
        """The partitions with records admitted and not settled."""
        return list(self._partitions)
