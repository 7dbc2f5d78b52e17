"""A consumer's lag, measured by the consumer itself, true while its partitions are paused.

librdkafka learns a partition's end offset only from its fetches, so the lag it reports freezes while the
partition is paused, and every tier consumer waits by pausing. This probe asks the end offsets of every
assigned partition with one batched ListOffsets request, at most once a second (`interval_s`), and never waits
for the answer: the poll loop calls `tick()` each iteration, which sends a request when the last one was
answered and the interval passed, and turns an answer that came into one `lag.measured` event per partition
(the lag in records and in seconds, retrytopics/core/lag.py, and the due time of the record it waits on).

It runs only while some hook wants `lag.measured` (the Prometheus hook does): an app without metrics sends
nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Set

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.lag import EndOffsetSamples
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import EndOffsetsPort, PendingEndOffsets
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock

__all__ = ["LagProbe"]

log = logging.getLogger("retrytopics.lag")


class LagProbe:
    """Measures the lag of one consumer's assigned partitions (see the module docstring).

    `unhandled_from(tp)`: the offset the consumer reads `tp` again from (None: not known yet, the partition is
    left out); `head_due_ms(tp)`: the due time of the record `tp` waits on (None: it waits on none)."""

    def __init__(
        self,
        end_offsets: Callable[[], EndOffsetsPort],
        emitter: Emitter,
        *,
        consumer_name: str,
        group_id: str,
        assigned: Set[TopicPartition],
        unhandled_from: Callable[[TopicPartition], int | None],
        head_due_ms: Callable[[TopicPartition], int | None],
        clock: Clock,
        interval_s: float = 1.0,
    ) -> None:
        self._make_port = end_offsets
        self._port: EndOffsetsPort | None = None
        self._emitter = emitter
        self._name = consumer_name
        self._group = group_id
        self._assigned = assigned
        self._unhandled_from = unhandled_from
        self._head_due_ms = head_due_ms
        self._clock = clock
        self._interval_s = interval_s
        self._pending: PendingEndOffsets | None = None
        self._asked_at: float | None = None
        self._samples: dict[TopicPartition, EndOffsetSamples] = {}
        #: ListOffsets requests sent (the cost: at most one per `interval_s`)
        self.requests = 0

    def tick(self) -> None:
        """Read an answer that came; ask again when due. Never waits on the broker."""
        if not self._emitter.wants(Event.LAG_MEASURED):
            return
        pending = self._pending
        if pending is not None:
            if not pending.done():
                return
            self._pending = None
            self._answered(pending)
        now = self._clock.monotonic()
        if self._assigned and (self._asked_at is None or now - self._asked_at >= self._interval_s):
            self._asked_at = now
            try:
                if self._port is None:
                    self._port = self._make_port()
                self._pending = self._port.request(sorted(self._assigned))
            except KafkaClientError as exc:
                log.debug("%s: no end offsets asked: %s", self._name, exc)
            self.requests += 1

    def _answered(self, pending: PendingEndOffsets) -> None:
        try:
            ends = pending.result()
        except KafkaClientError as exc:
            log.debug("%s: no end offsets this time: %s", self._name, exc)
            return
        now_ms = self._clock.now_ms()
        for tp in [tp for tp in self._samples if tp not in self._assigned]:
            del self._samples[tp]
        for tp, end in ends.items():
            start = self._unhandled_from(tp) if tp in self._assigned else None
            if start is None:
                continue
            samples = self._samples.setdefault(tp, EndOffsetSamples())
            samples.add(end, now_ms)
            self._emitter.emit(
                Event.LAG_MEASURED,
                consumer=self._name,
                group=self._group,
                topic=tp[0],
                partition=tp[1],
                lag=max(0, end - start),
                lag_s=samples.lag_ms(start, now_ms) / 1000,
                due_at=self._head_due_ms(tp),
                measured_at=now_ms,
            )
