"""Which offsets may be committed: the contiguous prefix of finished records, per partition.

Pure: standard library only. A record is *finished* when its handler succeeded, or when the republish that
carries its failure was acknowledged by the broker. Records finish out of order (a republish ack arrives
after later records succeeded), so a partition's commit position only moves over a gap-free prefix::

    tracker = OffsetTracker()
    epoch = tracker.assign(("orders", 0))
    for offset in (10, 11, 12):
        tracker.track(("orders", 0), offset)
    tracker.finish(("orders", 0), 11, epoch)
    tracker.commit_positions()            # {}: offset 10 is still in flight
    tracker.finish(("orders", 0), 10, epoch)
    tracker.commit_positions()            # {("orders", 0): 12}: Kafka commits the *next* offset to read

Every assignment of a partition gets a new *epoch*. An acknowledgement that arrives after the partition was
revoked (and maybe assigned again) carries the old epoch and is ignored: finishing a record is the owner's
decision, and a revoked partition has a new owner.

A partition's end may lie past its last record: a transaction's commit or abort marker, an aborted transaction's
records, none of which a read_committed consumer is ever handed. Committing `last finished + 1` would leave such a
partition short of its end for good (lag that never clears). So the tracker also knows how far records were
*read* (`read`), and once everything read is finished (`settled`), the consumer's position may replace the
commit position (`skip_to`): what lies between them was never a record to handle::

    tracker.read(("orders", 0), 12)       # records up to offset 11 were delivered
    tracker.settled()                     # [("orders", 0)]: everything read is finished
    tracker.skip_to(("orders", 0), 14)    # True: a marker and an aborted record are skipped; position 14
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

__all__ = ["OffsetTracker", "TopicPartition"]

#: A partition, as (topic, partition number).
TopicPartition: TypeAlias = tuple[str, int]


@dataclass(slots=True)
class _Partition:
    epoch: int
    in_flight: deque[int] = field(default_factory=deque)
    members: set[int] = field(default_factory=set)  # the offsets in `in_flight`, for O(1) lookups
    finished: set[int] = field(default_factory=set)
    position: int | None = None  # next offset to read, once a prefix finished
    committed: int | None = None  # the position last handed to a commit
    first: int | None = None  # first offset tracked in this epoch: the rewind target before any commit
    read_to: int | None = None  # one past the highest offset delivered in this epoch (`read`)

    def advance(self) -> None:
        while self.in_flight and self.in_flight[0] in self.finished:
            offset = self.in_flight.popleft()
            self.members.discard(offset)
            self.finished.discard(offset)
            self.position = offset + 1


def _settled(part: _Partition) -> bool:
    if part.in_flight:
        return False
    if part.read_to is None:  # nothing delivered in this epoch
        return part.position is None and part.first is None
    return part.position is not None and part.position >= part.read_to


class OffsetTracker:
    """Per-partition commit positions over a gap-free prefix of finished records (see the module docstring)."""

    def __init__(self) -> None:
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._epochs = 0

    def assign(self, tp: TopicPartition) -> int:
        """Start tracking `tp` from scratch; returns the new epoch."""
        self._epochs += 1
        self._partitions[tp] = _Partition(epoch=self._epochs)
        return self._epochs

    def revoke(self, tp: TopicPartition) -> None:
        """Forget `tp`; acknowledgements for it are ignored from now on."""
        self._partitions.pop(tp, None)

    def epoch(self, tp: TopicPartition) -> int | None:
        """The current epoch of `tp`, or None when it is not assigned."""
        part = self._partitions.get(tp)
        return part.epoch if part else None

    def track(self, tp: TopicPartition, offset: int) -> int:
        """Record that `offset` is being handled; returns the epoch to pass to `finish`.

        Offsets of one partition must be tracked in increasing order (the order Kafka delivers them);
        a partition that is not assigned is assigned implicitly.
        """
        part = self._partitions.get(tp)
        if part is None:
            self.assign(tp)
            part = self._partitions[tp]
        if part.in_flight and offset <= part.in_flight[-1]:
            raise ValueError(f"{tp}: offset {offset} tracked after {part.in_flight[-1]}; offsets must increase")
        if part.position is not None and offset < part.position:
            raise ValueError(f"{tp}: offset {offset} is before the finished position {part.position}")
        part.in_flight.append(offset)
        part.members.add(offset)
        if part.first is None:
            part.first = offset
        return part.epoch

    def finish(self, tp: TopicPartition, offset: int, epoch: int) -> bool:
        """Mark `offset` finished. False (and nothing changes) when `epoch` is stale or the offset unknown."""
        part = self._partitions.get(tp)
        if part is None or part.epoch != epoch or offset in part.finished or offset not in part.members:
            return False
        part.finished.add(offset)
        part.advance()
        return True

    def finish_at_once(self, tp: TopicPartition, offset: int) -> bool:
        """`track` and `finish` in one step, for a record finished as soon as it is read (its handler
        succeeded): when nothing of `tp` is in flight, the position moves without touching the queue."""
        part = self._partitions.get(tp)
        if part is None or part.in_flight:
            return self.finish(tp, offset, self.track(tp, offset))
        if part.position is not None and offset < part.position:
            raise ValueError(f"{tp}: offset {offset} is before the finished position {part.position}")
        if part.first is None:
            part.first = offset
        part.position = offset + 1
        return True

    def finish_run(self, tp: TopicPartition, offsets: list[int]) -> int:
        """`finish_at_once` for each of `offsets` (increasing): a batch handler's successes. Returns how many
        finished; when nothing of `tp` is in flight, the position moves once, to the last one."""
        part = self._partitions.get(tp)
        if not offsets:
            return 0
        if part is None or (part.position is not None and offsets[0] < part.position):
            return sum(self.finish_at_once(tp, offset) for offset in offsets)
        if part.first is None:
            part.first = offsets[0]
        if part.in_flight:  # they wait behind an earlier record's hand-off: queued as finished, en bloc
            if offsets[0] <= part.in_flight[-1]:
                raise ValueError(f"{tp}: offset {offsets[0]} tracked after {part.in_flight[-1]}; offsets must increase")
            part.in_flight.extend(offsets)
            part.members.update(offsets)
            part.finished.update(offsets)
            return len(offsets)
        part.position = offsets[-1] + 1
        return len(offsets)

    def finish_span(self, tp: TopicPartition, first: int, last: int) -> bool:
        """`finish_run` for a run known by its first and last offsets alone, where they settle it: when nothing of
        `tp` is in flight and `first` is not before the finished position, the position moves to `last` + 1 and
        True is returned; otherwise nothing changes (False) and the run needs `finish_run` with every offset."""
        part = self._partitions.get(tp)
        if part is None or part.in_flight or (part.position is not None and first < part.position):
            return False
        if part.first is None:
            part.first = first
        part.position = last + 1
        return True

    def read(self, tp: TopicPartition, next_offset: int) -> None:
        """Records of `tp` up to `next_offset` - 1 were delivered (handled, waiting, or parked: not yet known)."""
        part = self._partitions.get(tp)
        if part is not None and (part.read_to is None or next_offset > part.read_to):
            part.read_to = next_offset

    def settled(self) -> list[TopicPartition]:
        """The partitions whose every delivered record is finished: nothing in flight, and the commit position
        at or past what was read, or nothing read nor tracked in this epoch (the consumer's position is then
        where the assignment started, moved only past what a read_committed fetch skips). Only their consumer
        position may be committed (`skip_to`)."""
        return [tp for tp, part in self._partitions.items() if _settled(part)]

    def skip_to(self, tp: TopicPartition, consumer_position: int) -> bool:
        """Move a settled partition's commit position to the consumer's position, past what a read_committed
        consumer never delivers (markers, aborted records); whether it moved. Nothing changes unless `tp` is
        settled (see `settled`) and the consumer's position lies ahead: a position behind is a seek back."""
        part = self._partitions.get(tp)
        # nothing read in this epoch: a position of 0 skipped nothing (an empty partition is not committed)
        last = part.position if part is not None and part.position is not None else 0
        if part is None or not _settled(part) or consumer_position <= last:
            return False
        part.position = consumer_position
        part.read_to = consumer_position
        return True

    def in_flight(self, tp: TopicPartition) -> int:
        """Records of `tp` tracked but not yet finished (or finished behind an unfinished one)."""
        part = self._partitions.get(tp)
        return len(part.in_flight) if part else 0

    def unhandled_from(self, tp: TopicPartition) -> int | None:
        """The first offset of `tp` not finished: the oldest in flight, else the position (None: unknown)."""
        part = self._partitions.get(tp)
        if part is None:
            return None
        return part.in_flight[0] if part.in_flight else part.position

    def commit_positions(self, tps: list[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Positions (of `tps`, default all) that moved since they were last handed to `mark_committed`."""
        return {
            tp: position for tp, position in self.positions(tps).items() if position != self._partitions[tp].committed
        }

    def positions(self, tps: list[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Every known commit position (for the synchronous commit on revoke and shutdown)."""
        chosen = self._partitions if tps is None else {tp: self._partitions[tp] for tp in tps if tp in self._partitions}
        return {tp: part.position for tp, part in chosen.items() if part.position is not None}

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None:
        """Remember that these positions were handed to a commit."""
        for tp, position in positions.items():
            part = self._partitions.get(tp)
            if part is not None:
                part.committed = position

    def commit_failed(self, positions: Mapping[TopicPartition, int]) -> bool:
        """Forget that these positions were handed to a commit (it failed), so that `commit_positions` gives
        them again, unless a later commit was handed a position since; whether any is to commit again."""
        again = False
        for tp, position in positions.items():
            part = self._partitions.get(tp)
            if part is not None and part.committed == position:
                part.committed = None
                again = True
        return again

    def rewind(self, tp: TopicPartition) -> int | None:
        """Drop everything in flight for `tp` (an aborted transaction) and return where to seek: the last
        committed position, else the first offset tracked in this epoch; None if nothing was tracked."""
        part = self._partitions.get(tp)
        if part is None:
            return None
        target = part.committed if part.committed is not None else part.first
        part.in_flight.clear()
        part.members.clear()
        part.finished.clear()
        part.position = part.committed
        if part.committed is None:
            part.first = None
        return target
