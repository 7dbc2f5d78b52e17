"""When a consumer loop must leave a record alone: the consumer may no longer own the record's partition, or
the app is stopping. A record left alone (*abandoned*: a `record.abandoned` event) is neither handed off nor
committed here; it is read again, by this consumer or by whoever owns its partition now.

How ownership is judged is `runtime/ownership.py`. This module asks it at the two moments that matter: after
a handler call, and after a gap in polling (the process was frozen) before any record kept from before the
gap is touched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from retrytopics.core.ports import Message
from retrytopics.observe.events import Event
from retrytopics.runtime.ownership import OwnershipCheck
from retrytopics.runtime.pausing import PauseController

__all__ = ["OwnershipGuard"]

log = logging.getLogger("retrytopics.runtime")


class OwnershipGuard:
    """Says when a record must be left alone; `abandoned` tells the loop to read the rest of its batch again."""

    def __init__(
        self,
        check: OwnershipCheck,
        pauses: PauseController[Any],
        emit: Callable[..., None],
        *,
        name: str,
        stop: threading.Event,
        monotonic: Callable[[], float],
    ) -> None:
        self._check = check
        self._pauses = pauses
        self._emit = emit
        self._name = name
        self._stop = stop
        self.monotonic = monotonic
        #: when the last consume() returned: a handler call is judged by the time elapsed since
        self.polled_at = monotonic()
        #: until when (on `monotonic`) a handler call cannot have cost this consumer its partitions: a call
        #: that ends before it needs no `lost_ownership` question
        self.sure_until = self.polled_at + check.quiet_s
        #: a record of the current batch was left alone
        self.abandoned = False
        #: a watchdog found the current batch's handler call past `max.poll.interval.ms` and counted its
        #: record abandoned already (`overdue`)
        self.overdue_reported = False
        #: inside consume(): librdkafka's poll interval restarts with each poll, and a consume() that joins
        #: the group or seeds the duplicate check may take a while without any handler running
        self.in_poll = True

    def polled(self) -> float:
        """A consume() returned: a new batch, nothing abandoned yet. Returns when (`polled_at`)."""
        self.polled_at = self.monotonic()
        self.sure_until = self.polled_at + self._check.quiet_s
        self.abandoned = False
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
        """True when this consumer may no longer act on `msg`, just handled (`runtime/ownership.py` says why)."""
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
        self.abandoned = True
        if not self.overdue_reported:  # else counted already, when the call was found overdue
            self._emit(Event.RECORD_ABANDONED, topic=msg.topic, partition=msg.partition, offset=msg.offset)
        return True

    def woke_expelled(self, gap_s: float, batch: list[Message]) -> bool:
        """After a gap of `gap_s` in which this consumer did nothing (the process was frozen), ask the group
        coordinator before touching a record: librdkafka delivers `partitions.lost` only some ms after the
        wake, and records waiting in memory, or fetched before the freeze, would be handed off meanwhile by
        a consumer that owns nothing (measured: 3 in 40 freezes). Expelled: nothing is acted on; the queued
        records and `batch` are read again by whoever owns their partitions now. Costs a clock read unless
        the gap was long enough for the session to lapse."""
        if not self._check.may_have_lapsed(gap_s):
            return False
        starts = self._pauses.queue_starts()
        for msg in batch:
            starts[msg.tp] = min(starts.get(msg.tp, msg.offset), msg.offset)
        if not starts:
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
            len(starts),
        )
        for tp, offset in starts.items():
            self._emit(Event.RECORD_ABANDONED, topic=tp[0], partition=tp[1], offset=offset)
            self._pauses.restart_at(tp, offset)
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
