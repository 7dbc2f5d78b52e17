"""A consumer loop's rebalance callbacks (they run inside `consume()`), and whether its consumer joined the
group in time (the loop's health).

Assigned partitions start afresh, and the hand-offs already downstream of them are read
(runtime/records/duplicates.py). Revoked ones first commit what is finished; lost ones commit nothing (both
are the hand-off's, runtime/handoff/). Either is then forgotten: offsets, pauses, queued records, failing
publishes. A feature that keeps state per partition is told too (`AssignmentListener`: key order's key-state
reads, runtime/keyorder/learning.py), and names the assigned partitions it holds until it is ready.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.observe.events import Event
from retrytopics.runtime.handoff.handoff import HandOff
from retrytopics.runtime.records.duplicates import DuplicateCheck
from retrytopics.runtime.waiting import PauseController

__all__ = ["AssignmentListener", "GroupJoin", "RebalanceListener"]

log = logging.getLogger("retrytopics.runtime")


class AssignmentListener(Protocol):
    """A part told of the loop's assignments, inside the rebalance callbacks (so before any record of them)."""

    def assigned(self, tps: list[TopicPartition]) -> Iterable[TopicPartition]:
        """`tps` are assigned: returns those of them to hold until it lets them go (a hold reason's)."""

    def revoked(self, tps: list[TopicPartition]) -> None:
        """`tps` are revoked or lost: forget them."""


class GroupJoin:
    """Whether a consumer is in its group: joined within `timeout_s` of starting (an unreachable bootstrap,
    say, is retried by librdkafka forever: the loop reports itself unhealthy instead of waiting silently),
    and not out of it since. librdkafka reports an assignment lost when the group coordinator has not
    answered for `session.timeout.ms` (its broker died, say): unhealthy from then until the next assignment."""

    def __init__(self, *, name: str, group_id: str, timeout_s: float, monotonic: Callable[[], float]) -> None:
        self._name = name
        self._group_id = group_id
        self._timeout_s = timeout_s
        self._monotonic = monotonic
        self._started_at: float | None = None
        self._reported = False
        #: set by an assignment, even an empty one: the group answered; reset when the assignment is lost
        self.joined = False
        self._lost = False

    def started(self) -> None:
        self._started_at = self._monotonic()

    def assigned(self) -> None:
        self.joined = True
        self._lost = False

    def lost(self) -> None:
        """The assignment was lost: out of the group until the next assignment."""
        self.joined = False
        self._lost = True

    def in_time(self) -> bool:
        if self.joined or self._started_at is None:
            return True
        if self._lost:
            return False
        late = self._monotonic() - self._started_at > self._timeout_s
        if late and not self._reported:
            self._reported = True
            log.error(
                "%s: not in group %r %.0fs after starting (is the bootstrap reachable?); unhealthy until it joins",
                self._name,
                self._group_id,
                self._timeout_s,
            )
        return not late


class RebalanceListener:
    """`on_assign`, `on_revoke` and `on_lost` for one loop's consumer (see the module docstring)."""

    def __init__(
        self,
        tracker: OffsetTracker,
        pauses: PauseController,
        handoff: HandOff,
        duplicates: DuplicateCheck,
        emit: Callable[..., None],
        *,
        assigned: set[TopicPartition],
        join: GroupJoin,
        listeners: Sequence[AssignmentListener] = (),
        before_revoke: Sequence[Callable[[list[TopicPartition]], None]] = (),
    ) -> None:
        self._listeners = tuple(listeners)
        #: steps that settle what they hold of revoked partitions before the commit (handler concurrency's
        #: calls in flight, runtime/concurrency/)
        self._before_revoke = tuple(before_revoke)
        self._tracker = tracker
        self._pauses = pauses
        self._handoff = handoff
        self._duplicates = duplicates
        self._emit = emit
        self._assigned = assigned  # the loop's (shared with the strategy and the holds)
        self._join = join

    def on_assign(self, tps: list[TopicPartition]) -> None:
        self._join.assigned()
        for tp in tps:
            self._tracker.assign(tp)
        self._pauses.drop(tps)
        self._assigned.update(tps)
        self._duplicates.seed(tps)
        for listener in self._listeners:
            for tp in listener.assigned(tps):
                self._pauses.hold(tp, None)
        self._emit(Event.PARTITIONS_ASSIGNED, partitions=tps)

    def on_revoke(self, tps: list[TopicPartition]) -> None:
        for step in self._before_revoke:
            step(tps)
        self._handoff.revoked(tps)
        self._forget(tps)
        self._emit(Event.PARTITIONS_REVOKED, partitions=tps)

    def on_lost(self, tps: list[TopicPartition]) -> None:
        self._join.lost()
        self._handoff.lost(tps)
        self._forget(tps)
        self._emit(Event.PARTITIONS_LOST, partitions=tps)

    def _forget(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self._tracker.revoke(tp)
        self._pauses.drop(tps)
        self._handoff.publisher.forget(tps)
        self._assigned.difference_update(tps)
        for listener in self._listeners:
            listener.revoked(tps)
