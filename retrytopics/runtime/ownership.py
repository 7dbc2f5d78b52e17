"""Whether a consumer may still act on the record it has just handled.

Handlers run in the poll thread, so no rebalance callback runs during a call; but the group can move on
meanwhile. Either the call outlived `max.poll.interval.ms` (librdkafka then leaves the group, or is about
to), or the whole process was frozen (SIGSTOP, a VM pause) for longer than the session, and another member
owns the partition now. Handing the record off (a second republish, a second DLQ record) or committing would
then act for a partition this consumer no longer owns.

The first case is known from the clock. For the second, a call long enough for the session to have lapsed
is followed by a question to the group coordinator: a synchronous commit of what is already finished (useful
anyway), which the coordinator refuses to a member it has expelled.
"""

from __future__ import annotations

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.offsets import OffsetTracker
from retrytopics.core.ports import ConsumerPort
from retrytopics.runtime.bounded import CallAbandoned

__all__ = ["OwnershipCheck"]

#: Commit refusals that mean the group has moved on without this consumer (it is a zombie).
NOT_A_MEMBER = frozenset(
    {"UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "FENCED_INSTANCE_ID", "STALE_MEMBER_EPOCH", "_ASSIGNMENT_LOST"}
)

#: `_refused_commit`'s answer when it had nothing to ask with
_UNSURE = "<nothing to ask with>"


class OwnershipCheck:
    """Asked after every handler call (see the module docstring); costs a clock read unless the call was long."""

    def __init__(self, consumer: ConsumerPort, tracker: OffsetTracker, *, committed_only: bool = False) -> None:
        self._consumer = consumer
        self._tracker = tracker
        # exactly-once: offsets finished in an open transaction must not be committed outside it (an abort
        # would leave them committed without their hand-off), so the question repeats committed positions
        self._committed_only = committed_only
        # read once: the client's settings do not change while it runs
        self._max_poll_s = float(getattr(consumer, "max_poll_interval_ms", 300_000)) / 1000
        self._session_s = float(getattr(consumer, "session_timeout_ms", 45_000)) / 1000

    @property
    def max_poll_s(self) -> float:
        return self._max_poll_s

    @property
    def quiet_s(self) -> float:
        """How long after a poll `lost()` is always None: nothing can have lapsed yet."""
        return min(self._max_poll_s, self._session_s / 2)

    def may_have_lapsed(self, elapsed_s: float) -> bool:
        """Whether a gap this long could have cost the membership; below it `lost()` is always None."""
        return elapsed_s > self._max_poll_s or elapsed_s > self._session_s / 2

    def lost(self, elapsed_s: float, *, unsure_is_lost: bool = False) -> str | None:
        """Why this consumer may no longer act on a record whose call ended `elapsed_s` after the last poll;
        None when it may. With nothing to commit there is nothing to ask with: after a handler call that
        counts as still a member; `unsure_is_lost` (after a freeze, before touching kept records) as lost,
        since reading the records again costs only a fetch and gives librdkafka the time to report the loss."""
        if elapsed_s > self._max_poll_s:
            return "outlived max.poll.interval.ms"
        if elapsed_s > self._session_s / 2:
            code = self._refused_commit()
            if code is _UNSURE and unsure_is_lost:
                return f"took {elapsed_s:.1f}s and there was nothing to ask the group coordinator with"
            if code is not None and code is not _UNSURE:
                return f"took {elapsed_s:.1f}s and the group no longer counts this consumer as a member ({code})"
        return None

    def _refused_commit(self) -> str | None:
        positions = self._tracker.positions()
        if self._committed_only:
            moved = self._tracker.commit_positions()
            positions = {tp: p for tp, p in positions.items() if tp not in moved}
        if not positions:
            return _UNSURE  # nothing to commit, so nothing to ask with
        try:
            self._consumer.commit(positions, asynchronous=False)
        except CallAbandoned:
            return _UNSURE  # the coordinator did not answer within the bound (runtime/bounded.py)
        except KafkaClientError as exc:
            return exc.code if exc.code in NOT_A_MEMBER else None
        self._tracker.mark_committed(dict(positions))
        return None
