"""Whether a consumer may still act on the records it holds, and when it must leave one alone.

Handlers run in the poll thread, so no rebalance callback runs during a call; but the group can move on
meanwhile. Either the call outlived `max.poll.interval.ms` (librdkafka then leaves the group, or is about
to), or the whole process was frozen (SIGSTOP, a VM pause) for longer than the session, and another member
owns the partition now. Handing the record off (a second republish, a second DLQ record) or committing would
then act for a partition this consumer no longer owns.

The first case is known from the clock. For the second, a call long enough for the session to have lapsed
is followed by a question to the group coordinator: a synchronous commit of what is already finished (useful
anyway), which the coordinator refuses to a member it has expelled.

`OwnershipCheck` asks; `OwnershipGuard` asks it at the two moments that matter (after a handler call, and
after a gap in polling before any record kept from before the gap is touched) and says so: a record left
alone is *abandoned* (a `record.abandoned` event), and the records stage turns that answer into an
`Abandoned` outcome (runtime/records/outcome.py). It is neither handed off nor committed here; it is read
again, by this consumer or by whoever owns its partition now.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import ConsumerPort, Message
from retrytopics.observe.events import Event
from retrytopics.runtime.bounded import CallAbandoned

__all__ = ["OwnershipCheck", "OwnershipGuard"]

log = logging.getLogger("retrytopics.runtime")

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


class OwnershipGuard:
    """Says when a record must be left alone (see the module docstring)."""

    def __init__(
        self,
        check: OwnershipCheck,
        emit: Callable[..., None],
        *,
        name: str,
        stop: threading.Event,
        monotonic: Callable[[], float],
    ) -> None:
        self._check = check
        self._emit = emit
        self._name = name
        self._stop = stop
        self.monotonic = monotonic
        #: when the last consume() returned: a handler call is judged by the time elapsed since
        self.polled_at = monotonic()
        #: until when (on `monotonic`) a handler call cannot have cost this consumer its partitions: a call
        #: that ends before it needs no `lost_ownership` question
        self.sure_until = self.polled_at + check.quiet_s
        #: a watchdog found the current batch's handler call past `max.poll.interval.ms` and counted its
        #: record abandoned already (`overdue`)
        self.overdue_reported = False
        #: inside consume(): librdkafka's poll interval restarts with each poll, and a consume() that joins
        #: the group or seeds the duplicate check may take a while without any handler running
        self.in_poll = True

    def polled(self, *, since: float | None = None) -> float:
        """A consume() returned: a new batch. Returns when (`polled_at`): now, or `since` (a share consumer's
        poll call: its records were acquired, and their locks began, at some point of the poll)."""
        self.polled_at = self.monotonic() if since is None else since
        self.sure_until = self.polled_at + self._check.quiet_s
        self.overdue_reported = False
        self.in_poll = False
        return self.polled_at

    def overdue_s(self) -> float:
        """How far past `max.poll.interval.ms` this batch has run (0.0 within it): librdkafka has left, or is
        leaving, the group, and the record in hand is read again by whoever owns its partition next."""
        if self.in_poll:
            return 0.0
        return max(0.0, self.monotonic() - self.polled_at - self._check.max_poll_s)

    def report_overdue(self, record: Any) -> None:
        """From a watchdog thread, once per batch: the handler call in progress (`record`: its Record, or a
        batch handler's list) has outlived `max.poll.interval.ms`. Its record is counted abandoned now, not
        when (if ever) the call returns."""
        if self.overdue_reported:
            return
        self.overdue_reported = True
        first = record[0] if isinstance(record, list) and record else record
        where = (getattr(first, "topic", None), getattr(first, "partition", None), getattr(first, "offset", None))
        log.warning(
            "%s: a handler call on %s[%s]@%s has run past max.poll.interval.ms; this consumer is leaving "
            "its group, the record is neither handed off nor committed here, and is read again",
            self._name,
            *where,
        )
        self._emit(Event.RECORD_ABANDONED, topic=where[0], partition=where[1], offset=where[2])

    def lost_ownership(self, msg: Message) -> bool:
        """True when this consumer may no longer act on `msg`, just handled (`runtime/records/ownership.py` says why)."""
        why = self._check.lost(self.monotonic() - self.polled_at)
        if why is None:
            return False
        log.warning(
            "%s: handling %s[%d]@%d %s; the record is neither handed off nor committed here, and is read again "
            "by whoever owns its partition now",
            self._name,
            msg.topic,
            msg.partition,
            msg.offset,
            why,
        )
        if not self.overdue_reported:  # else counted already, when the call was found overdue
            self._emit(Event.RECORD_ABANDONED, topic=msg.topic, partition=msg.partition, offset=msg.offset)
        return True

    def woke_expelled(self, gap_s: float, kept_from: Callable[[], dict[TopicPartition, int]]) -> bool:
        """After a gap of `gap_s` in which this consumer did nothing (the process was frozen), ask the group
        coordinator before touching a record: librdkafka delivers `partitions.lost` only some ms after the
        wake, and records waiting in memory, or fetched before the freeze, would be handed off meanwhile by
        a consumer that owns nothing. `kept_from()`: where each partition with such records would be read
        again from. True (expelled): none of them may be acted on; each is counted abandoned, and the caller
        reads them again. Costs a clock read unless the gap was long enough for the session to lapse."""
        if not self._check.may_have_lapsed(gap_s):
            return False
        kept = kept_from()
        if not kept:
            return False  # nothing kept from before the gap: nothing to protect, nothing to ask
        why = self._check.lost(gap_s, unsure_is_lost=True)
        if why is None:
            return False
        log.warning(
            "%s: woke after a %.1fs gap in polling (%s); the records of %d partitions in memory are not acted on "
            "here and are read again by whoever owns their partitions now",
            self._name,
            gap_s,
            why,
            len(kept),
        )
        for tp, offset in kept.items():
            self._emit(Event.RECORD_ABANDONED, topic=tp[0], partition=tp[1], offset=offset)
        return True

    def stopping(self, msg: Message, failure: BaseException) -> bool:
        """True when the handler failed while the app is stopping (SIGTERM arrived mid-call): the failure may
        be the shutdown's doing, so it is no verdict on the record. It is neither handed off (no DLQ record)
        nor committed; the next run reads it again."""
        if not self._stop.is_set():
            return False
        log.warning(
            "%s: %s[%d]@%d failed while stopping (%s); not handed off, left uncommitted for the next run",
            self._name,
            msg.topic,
            msg.partition,
            msg.offset,
            type(failure).__name__,
        )
        self._emit(Event.RECORD_ABANDONED, topic=msg.topic, partition=msg.partition, offset=msg.offset)
        return True
